/* Matrix transpose. */
void transpose_2d(int N, int M, float y[M][N], const float x[N][M]) {
  for (int i = 0; i < N; i++)
    for (int j = 0; j < M; j++)
      y[j][i] = x[i][j];
}
