/* Layout change of a batch of images: NCHW to NHWC. */
void nchw_to_nhwc(int N, int C, int H, int W, float y[N][H][W][C], const float x[N][C][H][W]) {
  for (int n = 0; n < N; n++)
    for (int c = 0; c < C; c++)
      for (int h = 0; h < H; h++)
        for (int w = 0; w < W; w++)
          y[n][h][w][c] = x[n][c][h][w];
}
