/* Inclusive prefix sum along each row, each element from the one before it. */
void cumsum_rows(int N, int D, float y[N][D], const float x[N][D]) {
  for (int i = 0; i < N; i++) {
    y[i][0] = x[i][0];
    for (int j = 1; j < D; j++)
      y[i][j] = y[i][j - 1] + x[i][j];
  }
}
