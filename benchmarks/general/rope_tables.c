/* Rotary position embedding of interleaved pairs, cos and sin tables given per position. */
void rope_tables(int S, int NH, int D, float y[S][NH][D], const float x[S][NH][D],
                 const float cos_t[S][D / 2], const float sin_t[S][D / 2]) {
  for (int s = 0; s < S; s++)
    for (int h = 0; h < NH; h++)
      for (int k = 0; k < D / 2; k++) {
        float x0 = x[s][h][2 * k];
        float x1 = x[s][h][2 * k + 1];
        y[s][h][2 * k] = x0 * cos_t[s][k] - x1 * sin_t[s][k];
        y[s][h][2 * k + 1] = x0 * sin_t[s][k] + x1 * cos_t[s][k];
      }
}
