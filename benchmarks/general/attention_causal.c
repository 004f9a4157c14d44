/* One causal attention head: scores above the diagonal masked to -INFINITY before the
 * softmax; P holds the probabilities. */
#include <math.h>

void attention_causal(int S, int D, float out[S][D], float P[S][S], const float Q[S][D],
                      const float K[S][D], const float V[S][D], float scale) {
  for (int i = 0; i < S; i++)
    for (int j = 0; j < S; j++) {
      float dot = 0.0f;
      for (int d = 0; d < D; d++)
        dot += Q[i][d] * K[j][d];
      if (j > i)
        P[i][j] = -INFINITY;
      else
        P[i][j] = dot * scale;
    }
  for (int i = 0; i < S; i++) {
    float top = -INFINITY;
    for (int j = 0; j < S; j++)
      top = fmaxf(top, P[i][j]);
    float sum = 0.0f;
    for (int j = 0; j < S; j++) {
      P[i][j] = expf(P[i][j] - top);
      sum += P[i][j];
    }
    for (int j = 0; j < S; j++)
      P[i][j] = P[i][j] / sum;
  }
  for (int i = 0; i < S; i++)
    for (int d = 0; d < D; d++) {
      out[i][d] = 0.0f;
      for (int j = 0; j <= i; j++)
        out[i][d] += P[i][j] * V[j][d];
    }
}
