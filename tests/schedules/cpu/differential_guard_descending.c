void fz810758(int N, int M, int K, int T, float y0[1][N][M], const float x0[N][M], int q0[M]) {
  for (int i = 1; i < N; i++) {
    for (int j = M - 1; j >= 0; j--) {
      if (j > i + 1) {
        y0[0][i][j - 2] = (y0[0][0][j] + x0[i - 1][j - 1]);
      } else {
        q0[2] = (i + 2);
      }
    }
  }
}
