/* Batch-norm training statistics: per-channel mean and biased variance over N, H and W,
 * each a sum into its output array. */
void batchnorm_stats(int N, int C, int H, int W, float mean[C], float var[C],
                     const float x[N][C][H][W]) {
  for (int c = 0; c < C; c++) {
    mean[c] = 0.0f;
    var[c] = 0.0f;
  }
  for (int n = 0; n < N; n++)
    for (int c = 0; c < C; c++)
      for (int h = 0; h < H; h++)
        for (int w = 0; w < W; w++)
          mean[c] += x[n][c][h][w];
  for (int c = 0; c < C; c++)
    mean[c] /= N * H * W;
  for (int n = 0; n < N; n++)
    for (int c = 0; c < C; c++)
      for (int h = 0; h < H; h++)
        for (int w = 0; w < W; w++)
          var[c] += (x[n][c][h][w] - mean[c]) * (x[n][c][h][w] - mean[c]);
  for (int c = 0; c < C; c++)
    var[c] /= N * H * W;
}
