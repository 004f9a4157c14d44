/* SGD step with momentum and weight decay (PyTorch's form: dampening 0, not Nesterov). */
void sgd_momentum(int N, float w[N], float buf[N], const float g[N], float lr, float momentum,
                  float weight_decay) {
  for (int i = 0; i < N; i++) {
    float d = g[i] + weight_decay * w[i];
    buf[i] = momentum * buf[i] + d;
    w[i] = w[i] - lr * buf[i];
  }
}
