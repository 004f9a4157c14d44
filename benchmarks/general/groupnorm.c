/* GroupNorm: statistics over each group's channels and pixels; a per-channel affine. */
void groupnorm(int N, int G, int CG, int H, int W, float y[N][G][CG][H][W],
               const float x[N][G][CG][H][W], const float gamma[G][CG],
               const float beta[G][CG], float eps) {
  for (int n = 0; n < N; n++)
    for (int g = 0; g < G; g++) {
      float mean = 0.0f;
      for (int c = 0; c < CG; c++)
        for (int h = 0; h < H; h++)
          for (int w = 0; w < W; w++)
            mean += x[n][g][c][h][w];
      mean = mean / (CG * H * W);
      float var = 0.0f;
      for (int c = 0; c < CG; c++)
        for (int h = 0; h < H; h++)
          for (int w = 0; w < W; w++) {
            float d = x[n][g][c][h][w] - mean;
            var += d * d;
          }
      float rstd = 1.0f / sqrtf(var / (CG * H * W) + eps);
      for (int c = 0; c < CG; c++)
        for (int h = 0; h < H; h++)
          for (int w = 0; w < W; w++)
            y[n][g][c][h][w] = (x[n][g][c][h][w] - mean) * rstd * gamma[g][c] + beta[g][c];
    }
}
