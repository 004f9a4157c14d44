/* stdbool.h for polydl specs: empty. A spec needs nothing from it: polydl knows the math
   functions and the fixed-width integer types itself. */
