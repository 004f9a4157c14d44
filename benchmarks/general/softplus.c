/* Softplus, linear above a threshold as PyTorch's (beta 1, threshold 20). */
void softplus(int N, int D, float y[N][D], const float x[N][D]) {
  for (int i = 0; i < N; i++)
    for (int j = 0; j < D; j++)
      y[i][j] = x[i][j] > 20.0f ? x[i][j] : logf(1.0f + expf(x[i][j]));
}
