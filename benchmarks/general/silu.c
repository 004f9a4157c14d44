/* SiLU (swish): y = x sigmoid(x). */
void silu(int N, int D, float y[N][D], const float x[N][D]) {
  for (int i = 0; i < N; i++)
    for (int j = 0; j < D; j++)
      y[i][j] = x[i][j] / (1.0f + expf(-x[i][j]));
}
