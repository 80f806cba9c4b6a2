/*
 * The process default: what the registry builds for a device on first use,
 * chosen from the environment with no code change (as
 * PYTORCH_CUDA_ALLOC_CONF and JULIA_CUDA_MEMORY_POOL do).
 *
 *   RMMC_ALLOC_CONF   a stack spec (spec.h), e.g.
 *                     RMMC_ALLOC_CONF="statistics > pool(initial=1GiB) > cuda":
 *                     every device's default resource is that stack, built
 *                     for the device on its first use. Unset or blank: the
 *                     plain cuda resource.
 *   RMMC_NO_CACHING   1 (or true, yes, on) forces the plain cuda resource
 *                     (cudaMalloc/cudaFree per allocation) whatever
 *                     RMMC_ALLOC_CONF says, so memory checkers such as
 *                     compute-sanitizer see every allocation (PyTorch's
 *                     PYTORCH_NO_CUDA_MEMORY_CACHING). 0, false, no, off or
 *                     blank leave RMMC_ALLOC_CONF in charge.
 *
 * The environment is read once, at the first default built or the first
 * rmmc_default_config_status() call, whichever comes first. A value that
 * does not parse never stops the process: it is reported once on stderr
 * (the one place rmmc prints without being asked: the environment asked)
 * and through rmmc_default_config_status(), and the plain cuda resource is
 * used instead. A spec that parses but cannot be built for a device (an
 * initial pool larger than the device, say) is reported the same way and
 * that device gets the plain cuda resource.
 */
#ifndef RMMC_DEFAULTS_H
#define RMMC_DEFAULTS_H

#include <stddef.h>

#include "rmmc/export.h"
#include "rmmc/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The spec used when nothing else is asked for. */
#define RMMC_DEFAULT_SPEC "cuda"

/* Works out the spec the process default uses for the given values of
 * RMMC_ALLOC_CONF and RMMC_NO_CACHING (NULL: unset), without reading the
 * environment, printing or building anything, and writes it into `spec`
 * (`len` bytes, always terminated). RMMC_SUCCESS: `spec` is the spec to
 * build. RMMC_ERROR_PARSE: a value does not parse (the message says which
 * and why, quoting the spec with a caret) and `spec` is the fallback,
 * RMMC_DEFAULT_SPEC. RMMC_ERROR_INVALID_ARGUMENT for a NULL spec or a
 * buffer too small for the result. Thread-safe. */
RMMC_EXPORT rmmc_status_t rmmc_default_config_resolve(const char *alloc_conf,
                                                      const char *no_caching, char *spec,
                                                      size_t len);

/* Reads the environment if that has not happened yet and says how the
 * process default was configured: RMMC_SUCCESS when the environment parsed
 * and every default built so far is what it asked for; otherwise the
 * status of the first problem (RMMC_ERROR_PARSE for a value that does not
 * parse, or the status a layer returned when the spec was built for a
 * device) after which the plain cuda resource is used. *spec (if spec is
 * not NULL) receives the spec the environment chose (RMMC_DEFAULT_SPEC
 * after a parse error) and *message (if not NULL) "" or the text reported
 * on stderr; both strings live as long as the process. Thread-safe; never
 * calls CUDA. */
RMMC_EXPORT rmmc_status_t rmmc_default_config_status(const char **spec, const char **message);

#ifdef __cplusplus
}
#endif

#endif /* RMMC_DEFAULTS_H */
