/* C = alpha A B + beta C (BLAS form). */
void gemm(int NI, int NJ, int NK, double alpha, double beta, double C[NI][NJ],
          const double A[NI][NK], const double B[NK][NJ]) {
  for (int i = 0; i < NI; i++) {
    for (int j = 0; j < NJ; j++)
      C[i][j] *= beta;
    for (int k = 0; k < NK; k++)
      for (int j = 0; j < NJ; j++)
        C[i][j] += alpha * A[i][k] * B[k][j];
  }
}
