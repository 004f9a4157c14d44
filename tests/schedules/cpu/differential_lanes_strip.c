void fz808431(int N, int M, const double x0[2 * N], double y0[N + 1][N + 1], double y1[N][M + 1], const double x1[M], double y2[N][2 * M]) {
  for (int i = M - 1; i >= 0; i--) {
    for (int j = 1; j <= N - 1; j++) {
      for (int k = 0; k <= i; k++) {
        y1[j - 1][k] = (((0.1717 * log((1.0 + fabs(((0.6479 * x1[k]) - (0.2841 * fmin(y0[j + 1][j - 1], x0[j + 2]))))))) + (0.3815 * y0[j - 1][j + 1])) - (0.0671 * y1[j - 1][k + 1]));
        y2[j][k + i] -= (0.7797 * x0[j - 1]);
      }
      for (int k = N - 1; k >= 0; k--) {
        y1[k][i] -= (((0.0625 * (y1[k][-i + M] >= 0.3571 ? log((1.0 + fabs(y1[k][i]))) : tanh(y0[j][j - 1]))) + (0.6956 * x1[i])) - (0.1819 * fmin(log((1.0 + fabs(y0[k][k]))), x1[1])));
      }
    }
  }
}
