/* B = alpha A^T B with A unit lower triangular. */
void trmm(int M, int N, double alpha, const double A[M][M], double B[M][N]) {
  for (int i = 0; i < M; i++)
    for (int j = 0; j < N; j++) {
      for (int k = i + 1; k < M; k++)
        B[i][j] += A[k][i] * B[k][j];
      B[i][j] = alpha * B[i][j];
    }
}
