/* InstanceNorm over each image's channel planes, with a per-channel affine. */
void instancenorm(int N, int C, int H, int W, float y[N][C][H][W], const float x[N][C][H][W],
                  const float gamma[C], const float beta[C], float eps) {
  for (int n = 0; n < N; n++)
    for (int c = 0; c < C; c++) {
      float sum = 0.0f;
      for (int h = 0; h < H; h++)
        for (int w = 0; w < W; w++)
          sum += x[n][c][h][w];
      float mean = sum / (H * W);
      float sq = 0.0f;
      for (int h = 0; h < H; h++)
        for (int w = 0; w < W; w++)
          sq += (x[n][c][h][w] - mean) * (x[n][c][h][w] - mean);
      float rstd = 1.0f / sqrtf(sq / (H * W) + eps);
      for (int h = 0; h < H; h++)
        for (int w = 0; w < W; w++)
          y[n][c][h][w] = gamma[c] * (x[n][c][h][w] - mean) * rstd + beta[c];
    }
}
