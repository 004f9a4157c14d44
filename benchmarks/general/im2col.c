/* im2col of a 3 x 3 window with padding 1, stride 1: one row per (channel, r, s), zeros where
 * the window leaves the image. */
void im2col(int C, int H, int W, float col[C * 9][H][W], const float x[C][H][W]) {
  for (int c = 0; c < C; c++)
    for (int r = 0; r < 3; r++)
      for (int s = 0; s < 3; s++)
        for (int h = 0; h < H; h++)
          for (int w = 0; w < W; w++) {
            if (h + r - 1 >= 0 && h + r - 1 < H && w + s - 1 >= 0 && w + s - 1 < W)
              col[(c * 3 + r) * 3 + s][h][w] = x[c][h + r - 1][w + s - 1];
            else
              col[(c * 3 + r) * 3 + s][h][w] = 0.0f;
          }
}
