/* Adam step t (from 1) with bias correction; weight decay added to the gradient. */
void adam(int N, int t, float w[N], float m[N], float v[N], const float g[N], float lr,
          float beta1, float beta2, float eps, float weight_decay) {
  for (int i = 0; i < N; i++) {
    float grad = g[i] + weight_decay * w[i];
    m[i] = beta1 * m[i] + (1.0f - beta1) * grad;
    v[i] = beta2 * v[i] + (1.0f - beta2) * grad * grad;
    float m_hat = m[i] / (1.0f - powf(beta1, t));
    float v_hat = v[i] / (1.0f - powf(beta2, t));
    w[i] -= lr * m_hat / (sqrtf(v_hat) + eps);
  }
}
