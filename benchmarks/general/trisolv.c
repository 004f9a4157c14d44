/* Forward substitution: L x = b. */
void trisolv(int N, const double L[N][N], double x[N], const double b[N]) {
  for (int i = 0; i < N; i++) {
    x[i] = b[i];
    for (int j = 0; j < i; j++)
      x[i] -= L[i][j] * x[j];
    x[i] = x[i] / L[i][i];
  }
}
