/* Cross-entropy with integer labels: log-softmax of each row, then the label's entry. */
void cross_entropy(int N, int V, float loss[N], float lp[N][V], const float logits[N][V],
                   const int label[N]) {
  for (int n = 0; n < N; n++) {
    float top = logits[n][0];
    for (int v = 1; v < V; v++)
      top = fmaxf(top, logits[n][v]);
    float sum = 0.0f;
    for (int v = 0; v < V; v++)
      sum += expf(logits[n][v] - top);
    for (int v = 0; v < V; v++)
      lp[n][v] = logits[n][v] - top - logf(sum);
    loss[n] = -lp[n][label[n]];
  }
}
