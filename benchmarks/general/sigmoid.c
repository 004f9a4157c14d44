/* Logistic sigmoid. */
void sigmoid(int N, int D, float y[N][D], const float x[N][D]) {
  for (int i = 0; i < N; i++)
    for (int j = 0; j < D; j++)
      y[i][j] = 1.0f / (1.0f + expf(-x[i][j]));
}
