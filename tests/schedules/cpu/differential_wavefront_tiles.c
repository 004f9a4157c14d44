void f(int N, int M, int T, float y0[M][N + 2], const float x0[N], float y1[N], const float x1[M][N], float y2[M][2 * N], const float x2[N][M], float y4[N + 2][M], int q0[N]) {
  for (int i = N - 1; i >= 0; i--) {
    for (int j = 1; j < M; j++) {
      for (int k = i + 1; k < N; k++) {
        if ((i + 1) % 2 == 1) {
          y0[j][k + 2] = y1[k];
          y1[k] = 0.0625f;
        } else {
          y1[k] = 0.8496f;
          y1[k - 1] = y0[j][k];
        }
      }
      float s0 = (0.0835f * fmaxf(y1[i], x2[1][j]));
      y1[i] = (((0.2057f * erff((0.8525f * fmaxf(x0[i], x1[-j + M][-i + N - 1])))) + (0.4733f * y2[-j + M][2 * i])) + (0.0625f * s0));
      y4[i][j] = ((0.5f * s0) + ((0.2906f * y1[i]) + (0.3581f * x0[i])));
    }
    y4[i + 2][0] = ((0.1351f * (0.01f * q0[i])) + (0.6566f * y1[i]));
  }
}
