/* Rotary position embedding computing each angle: position * 10000^(-2k/D). */
void rope_computed(int S, int NH, int D, float y[S][NH][D], const float x[S][NH][D]) {
  for (int s = 0; s < S; s++)
    for (int h = 0; h < NH; h++)
      for (int k = 0; k < D / 2; k++) {
        float freq = 1.0f / powf(10000.0f, (float)(2 * k) / D);
        float angle = s * freq;
        float c = cosf(angle);
        float sn = sinf(angle);
        float x0 = x[s][h][2 * k];
        float x1 = x[s][h][2 * k + 1];
        y[s][h][2 * k] = x0 * c - x1 * sn;
        y[s][h][2 * k + 1] = x0 * sn + x1 * c;
      }
}
