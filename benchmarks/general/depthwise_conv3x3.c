/* Depthwise 3 x 3 convolution, padding 1, stride 1, bounds tested in the loop. */
void depthwise_conv3x3(int N, int C, int H, int W, float y[N][C][H][W],
                       const float x[N][C][H][W], const float k[C][3][3]) {
  for (int n = 0; n < N; n++)
    for (int c = 0; c < C; c++)
      for (int h = 0; h < H; h++)
        for (int w = 0; w < W; w++) {
          float acc = 0.0f;
          for (int r = 0; r < 3; r++)
            for (int s = 0; s < 3; s++)
              if (h + r - 1 >= 0 && h + r - 1 < H && w + s - 1 >= 0 && w + s - 1 < W)
                acc += x[n][c][h + r - 1][w + s - 1] * k[c][r][s];
          y[n][c][h][w] = acc;
        }
}
