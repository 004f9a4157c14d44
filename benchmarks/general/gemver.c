/* A += u1 v1^T + u2 v2^T; x += beta A^T y + z; w += alpha A x. */
void gemver(int N, double alpha, double beta, double A[N][N], const double u1[N],
            const double v1[N], const double u2[N], const double v2[N], double w[N],
            double x[N], const double y[N], const double z[N]) {
  for (int i = 0; i < N; i++)
    for (int j = 0; j < N; j++)
      A[i][j] = A[i][j] + u1[i] * v1[j] + u2[i] * v2[j];
  for (int i = 0; i < N; i++)
    for (int j = 0; j < N; j++)
      x[i] = x[i] + beta * A[j][i] * y[j];
  for (int i = 0; i < N; i++)
    x[i] = x[i] + z[i];
  for (int i = 0; i < N; i++)
    for (int j = 0; j < N; j++)
      w[i] = w[i] + alpha * A[i][j] * x[j];
}
