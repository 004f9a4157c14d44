// C[M][N] += A[M][K] * B[K][N]: the classic GEMM loop nest.
//   polydl run examples/matmul.c -p M=512 -p N=512 -p K=512
void matmul(int M, int N, int K, float C[M][N], const float A[M][K], const float B[K][N]) {
  for (int i = 0; i < M; i++)
    for (int j = 0; j < N; j++)
      for (int k = 0; k < K; k++)
        C[i][j] += A[i][k] * B[k][j];
}
