/* One attention head: out = softmax(Q K^T * scale) V, row by row; P holds the probabilities. */
void attention(int S, int D, float out[S][D], float P[S][S], const float Q[S][D],
               const float K[S][D], const float V[S][D], float scale) {
  for (int i = 0; i < S; i++)
    for (int j = 0; j < S; j++) {
      P[i][j] = 0.0f;
      for (int d = 0; d < D; d++)
        P[i][j] += Q[i][d] * K[j][d];
    }
  for (int i = 0; i < S; i++) {
    float top = P[i][0] * scale;
    for (int j = 1; j < S; j++)
      if (P[i][j] * scale > top) top = P[i][j] * scale;
    float sum = 0.0f;
    for (int j = 0; j < S; j++) {
      P[i][j] = expf(P[i][j] * scale - top);
      sum += P[i][j];
    }
    for (int j = 0; j < S; j++)
      P[i][j] /= sum;
  }
  for (int i = 0; i < S; i++)
    for (int d = 0; d < D; d++) {
      out[i][d] = 0.0f;
      for (int j = 0; j < S; j++)
        out[i][d] += P[i][j] * V[j][d];
    }
}
