/* s = A^T r and q = A p, in one sweep over A. */
void bicg(int M, int N, const double A[N][M], double s[M], double q[N], const double p[M],
          const double r[N]) {
  for (int i = 0; i < M; i++)
    s[i] = 0;
  for (int i = 0; i < N; i++) {
    q[i] = 0.0;
    for (int j = 0; j < M; j++) {
      s[j] = s[j] + r[i] * A[i][j];
      q[i] = q[i] + A[i][j] * p[j];
    }
  }
}
