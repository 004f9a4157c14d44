/* Batched GEMM: C[b] = alpha A[b] B[b] + beta C[b], batches and rows in parallel. */
void batched_gemm(int B, int M, int N, int K, float C[B][M][N], const float A[B][M][K],
                  const float Bm[B][K][N], float alpha, float beta) {
  #pragma omp parallel for collapse(2)
  for (int b = 0; b < B; b++)
    for (int i = 0; i < M; i++) {
      for (int j = 0; j < N; j++)
        C[b][i][j] *= beta;
      for (int k = 0; k < K; k++)
        for (int j = 0; j < N; j++)
          C[b][i][j] += alpha * A[b][i][k] * Bm[b][k][j];
    }
}
