/* Lower triangle of C = alpha A A^T + beta C. */
void syrk(int N, int M, double alpha, double beta, double C[N][N], const double A[N][M]) {
  for (int i = 0; i < N; i++) {
    for (int j = 0; j <= i; j++)
      C[i][j] *= beta;
    for (int k = 0; k < M; k++)
      for (int j = 0; j <= i; j++)
        C[i][j] += alpha * A[i][k] * A[j][k];
  }
}
