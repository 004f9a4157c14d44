/* Embedding backward: each token's gradient row added into its table row (tokens repeat). */
void embedding_backward(int T, int V, int D, float dW[V][D], const int tok[T],
                        const float g[T][D]) {
  for (int i = 0; i < T; i++)
    for (int j = 0; j < D; j++)
      dW[tok[i]][j] += g[i][j];
}
