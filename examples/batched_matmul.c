// Batched GEMM: one independent C[b] += X[b] * Y[b] per batch entry.
void bmm(int B, int M, int N, int K, float C[B][M][N], const float X[B][M][K], const float Y[B][K][N]) {
  for (int b = 0; b < B; b++)
    for (int i = 0; i < M; i++)
      for (int j = 0; j < N; j++)
        for (int k = 0; k < K; k++)
          C[b][i][j] += X[b][i][k] * Y[b][k][j];
}
