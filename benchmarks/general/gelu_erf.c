/* GELU, exact form: y = x/2 (1 + erf(x / sqrt 2)). */
void gelu_erf(int N, int D, float y[N][D], const float x[N][D]) {
  for (int i = 0; i < N; i++)
    for (int j = 0; j < D; j++)
      y[i][j] = 0.5f * x[i][j] * (1.0f + erff(x[i][j] * 0.70710678f));
}
