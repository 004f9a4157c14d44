/* QR by modified Gram-Schmidt: A (M x N) -> Q, R. */
void gramschmidt(int M, int N, double A[M][N], double R[N][N], double Q[M][N]) {
  for (int k = 0; k < N; k++) {
    double nrm = 0.0;
    for (int i = 0; i < M; i++)
      nrm += A[i][k] * A[i][k];
    R[k][k] = sqrt(nrm);
    for (int i = 0; i < M; i++)
      Q[i][k] = A[i][k] / R[k][k];
    for (int j = k + 1; j < N; j++) {
      R[k][j] = 0.0;
      for (int i = 0; i < M; i++)
        R[k][j] += Q[i][k] * A[i][j];
      for (int i = 0; i < M; i++)
        A[i][j] = A[i][j] - Q[i][k] * R[k][j];
    }
  }
}
