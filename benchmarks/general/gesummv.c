/* y = alpha A x + beta B x. */
void gesummv(int N, double alpha, double beta, const double A[N][N], const double B[N][N],
             double tmp[N], const double x[N], double y[N]) {
  for (int i = 0; i < N; i++) {
    tmp[i] = 0.0;
    y[i] = 0.0;
    for (int j = 0; j < N; j++) {
      tmp[i] = A[i][j] * x[j] + tmp[i];
      y[i] = B[i][j] * x[j] + y[i];
    }
    y[i] = alpha * tmp[i] + beta * y[i];
  }
}
