/* Mish: y = x tanh(softplus(x)). */
void mish(int N, int D, float y[N][D], const float x[N][D]) {
  for (int i = 0; i < N; i++)
    for (int j = 0; j < D; j++) {
      float sp = logf(1.0f + expf(x[i][j]));
      y[i][j] = x[i][j] * tanhf(sp);
    }
}
