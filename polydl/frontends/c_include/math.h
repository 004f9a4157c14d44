/* math.h for polydl specs: polydl's own stand-in, not the C library's. It defines the
   constants below and declares the math functions polydl compiles (float forms, and the
   double forms without 'f'); any other name of the C library's math.h is an error that lists
   these. INFINITY and NAN are divisions the C compiler folds: polydl writes them into the
   kernel as they stand, so -INFINITY is -inf there. */
#ifndef POLYDL_MATH_H
#define POLYDL_MATH_H

#define INFINITY (1.0f / 0.0f)
#define NAN (0.0f / 0.0f)
#define HUGE_VALF (1.0f / 0.0f)
#define HUGE_VAL (1.0 / 0.0)

/* glibc's values, to the digits it gives */
#define M_E 2.7182818284590452354
#define M_LOG2E 1.4426950408889634074
#define M_LOG10E 0.43429448190325182765
#define M_LN2 0.69314718055994530942
#define M_LN10 2.30258509299404568402
#define M_PI 3.14159265358979323846
#define M_PI_2 1.57079632679489661923
#define M_PI_4 0.78539816339744830962
#define M_1_PI 0.31830988618379067154
#define M_2_PI 0.63661977236758134308
#define M_2_SQRTPI 1.12837916709551257390
#define M_SQRT2 1.41421356237309504880
#define M_SQRT1_2 0.70710678118654752440

float expf(float);
float logf(float);
float sqrtf(float);
float tanhf(float);
float fabsf(float);
float sinf(float);
float cosf(float);
float erff(float);
float fmaxf(float, float);
float fminf(float, float);
float powf(float, float);

double exp(double);
double log(double);
double sqrt(double);
double tanh(double);
double fabs(double);
double sin(double);
double cos(double);
double erf(double);
double fmax(double, double);
double fmin(double, double);
double pow(double, double);

#endif
