/* stdlib.h for polydl specs: polydl's own stand-in, empty. A spec needs nothing from it:
   polydl knows the fixed-width integer types itself, and <math.h> and <float.h> hold the
   math functions and constants. */
