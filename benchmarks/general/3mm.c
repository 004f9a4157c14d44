/* G = (A B) (C D). */
void k3mm(int NI, int NJ, int NK, int NL, int NM, double E[NI][NJ], const double A[NI][NK],
          const double B[NK][NJ], double F[NJ][NL], const double C[NJ][NM],
          const double D[NM][NL], double G[NI][NL]) {
  for (int i = 0; i < NI; i++)
    for (int j = 0; j < NJ; j++) {
      E[i][j] = 0.0;
      for (int k = 0; k < NK; ++k)
        E[i][j] += A[i][k] * B[k][j];
    }
  for (int i = 0; i < NJ; i++)
    for (int j = 0; j < NL; j++) {
      F[i][j] = 0.0;
      for (int k = 0; k < NM; ++k)
        F[i][j] += C[i][k] * D[k][j];
    }
  for (int i = 0; i < NI; i++)
    for (int j = 0; j < NL; j++) {
      G[i][j] = 0.0;
      for (int k = 0; k < NJ; ++k)
        G[i][j] += E[i][k] * F[k][j];
    }
}
