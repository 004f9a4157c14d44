/* Lower triangle of C = alpha A B^T + alpha B A^T + beta C. */
void syr2k(int N, int M, double alpha, double beta, double C[N][N], const double A[N][M],
           const double B[N][M]) {
  for (int i = 0; i < N; i++) {
    for (int j = 0; j <= i; j++)
      C[i][j] *= beta;
    for (int k = 0; k < M; k++)
      for (int j = 0; j <= i; j++)
        C[i][j] += A[j][k] * alpha * B[i][k] + B[j][k] * alpha * A[i][k];
  }
}
