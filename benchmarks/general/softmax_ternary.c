/* Row softmax in three passes, the maximum by a ternary and the sum in its own loop. */
void softmax_ternary(int N, int D, float y[N][D], const float x[N][D]) {
  for (int i = 0; i < N; i++) {
    float m = x[i][0];
    for (int j = 1; j < D; j++)
      m = x[i][j] > m ? x[i][j] : m;
    for (int j = 0; j < D; j++)
      y[i][j] = expf(x[i][j] - m);
    float s = 0.0f;
    for (int j = 0; j < D; j++)
      s += y[i][j];
    for (int j = 0; j < D; j++)
      y[i][j] = y[i][j] / s;
  }
}
