/* A[r][q][:] = A[r][q][:] C4, through a row buffer. */
void doitgen(int NR, int NQ, int NP, double A[NR][NQ][NP], const double C4[NP][NP],
             double sum[NP]) {
  for (int r = 0; r < NR; r++)
    for (int q = 0; q < NQ; q++) {
      for (int p = 0; p < NP; p++) {
        sum[p] = 0.0;
        for (int s = 0; s < NP; s++)
          sum[p] += A[r][q][s] * C4[s][p];
      }
      for (int p = 0; p < NP; p++)
        A[r][q][p] = sum[p];
    }
}
