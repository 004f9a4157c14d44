/* BLAS-form GEMM: C = alpha * A B + beta * C, with alpha and beta given at call time:
 *   polydl run examples/gemm_blas.c -p M=256 -p N=256 -p K=256
 *   k = polydl.compile("examples/gemm_blas.c", {"M": 256, "N": 256, "K": 256})
 *   k(A, B, alpha=1.5, beta=0.5, C=c)        # updates c in place */
void gemm(int M, int N, int K, float C[M][N], const float A[M][K], const float B[K][N],
          float alpha, float beta) {
  for (int i = 0; i < M; i++) {
    for (int j = 0; j < N; j++)
      C[i][j] *= beta;
    for (int k = 0; k < K; k++)
      for (int j = 0; j < N; j++)
        C[i][j] += alpha * A[i][k] * B[k][j];
  }
}
