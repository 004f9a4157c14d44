/* Alternating-direction implicit solver of 2-d heat diffusion. */
void adi(int TSTEPS, int N, double u[N][N], double v[N][N], double p[N][N], double q[N][N]) {
  double DX = 1.0 / N;
  double DY = 1.0 / N;
  double DT = 1.0 / TSTEPS;
  double mul1 = 2.0 * DT / (DX * DX);
  double mul2 = 1.0 * DT / (DY * DY);
  double a = -mul1 / 2.0;
  double b = 1.0 + mul1;
  double c = a;
  double d = -mul2 / 2.0;
  double e = 1.0 + mul2;
  double f = d;
  for (int t = 1; t <= TSTEPS; t++) {
    for (int i = 1; i < N - 1; i++) {
      v[0][i] = 1.0;
      p[i][0] = 0.0;
      q[i][0] = v[0][i];
      for (int j = 1; j < N - 1; j++) {
        p[i][j] = -c / (a * p[i][j - 1] + b);
        q[i][j] = (-d * u[j][i - 1] + (1.0 + 2.0 * d) * u[j][i] - f * u[j][i + 1]
                   - a * q[i][j - 1]) / (a * p[i][j - 1] + b);
      }
      v[N - 1][i] = 1.0;
      for (int j = N - 2; j >= 1; j--)
        v[j][i] = p[i][j] * v[j + 1][i] + q[i][j];
    }
    for (int i = 1; i < N - 1; i++) {
      u[i][0] = 1.0;
      p[i][0] = 0.0;
      q[i][0] = u[i][0];
      for (int j = 1; j < N - 1; j++) {
        p[i][j] = -f / (d * p[i][j - 1] + e);
        q[i][j] = (-a * v[i - 1][j] + (1.0 + 2.0 * a) * v[i][j] - c * v[i + 1][j]
                   - d * q[i][j - 1]) / (d * p[i][j - 1] + e);
      }
      u[i][N - 1] = 1.0;
      for (int j = N - 2; j >= 1; j--)
        u[i][j] = p[i][j] * u[i][j + 1] + q[i][j];
    }
  }
}
