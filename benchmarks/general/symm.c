/* C = alpha A B + beta C with A symmetric, its lower triangle stored. */
void symm(int M, int N, double alpha, double beta, double C[M][N], const double A[M][M],
          const double B[M][N]) {
  for (int i = 0; i < M; i++)
    for (int j = 0; j < N; j++) {
      double temp2 = 0;
      for (int k = 0; k < i; k++) {
        C[k][j] += alpha * B[i][j] * A[i][k];
        temp2 += B[k][j] * A[i][k];
      }
      C[i][j] = beta * C[i][j] + alpha * B[i][j] * A[i][i] + alpha * temp2;
    }
}
