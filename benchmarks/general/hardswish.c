/* Hard swish with clamps: y = x min(max(x + 3, 0), 6) / 6. */
void hardswish(int N, int D, float y[N][D], const float x[N][D]) {
  for (int i = 0; i < N; i++)
    for (int j = 0; j < D; j++)
      y[i][j] = x[i][j] * fminf(fmaxf(x[i][j] + 3.0f, 0.0f), 6.0f) / 6.0f;
}
