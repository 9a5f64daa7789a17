/* What a front end (the CLI, the server) hands the sampler for values at the edges of fp32.
 *   - temperature: the sampler divides the logits by T; below FM_GREEDY_TEMPERATURE_BELOW a logit of 1e8 would
 *     overflow fp32 (and a denormal T turns every logit into inf), while the distribution is already a point mass
 *     on the argmax at far larger T: such a T is greedy (0).
 *   - top_p: a positive p that rounds to 0 in fp32 (1e-50) keeps only the most likely id, as the smallest positive
 *     float does; it must not become 0, which the sampler refuses. */
#ifndef FM_ENGINE_SAMPLING_LIMITS_H
#define FM_ENGINE_SAMPLING_LIMITS_H

#include <float.h>

#define FM_GREEDY_TEMPERATURE_BELOW 1e-30

static inline float fm_sampler_temperature(double t) { return t < FM_GREEDY_TEMPERATURE_BELOW ? 0.0f : (float)t; }

static inline float fm_sampler_top_p(double p) { return p > 0.0 && (float)p < FLT_MIN ? FLT_MIN : (float)p; }

#endif
