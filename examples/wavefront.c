// A loop-carried dependence in both loops: polydl keeps the order and runs it sequentially.
//   polydl run examples/wavefront.c -p N=1000
void wavefront(int N, float A[N][N]) {
  for (int i = 1; i < N; i++)
    for (int j = 1; j < N; j++)
      A[i][j] = 0.5f * (A[i - 1][j] + A[i][j - 1]);
}
