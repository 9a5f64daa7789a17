/* The table of backend kinds (backend_kind.h). */
#include "backend/backend_kind.h"

#include <string.h>

#include "util/status.h"

static const fm_backend_kind *const kinds[] = {&fm_backend_kind_cpu, &fm_backend_kind_cuda};

const fm_backend_kind *fm_backend_kind_find(const char *name) {
    for (size_t i = 0; name && i < sizeof kinds / sizeof *kinds; i++)
        if (strcmp(name, kinds[i]->name) == 0) return kinds[i];
    return NULL;
}

fm_status fm_backend_kind_get(const char *name, const char *what, const fm_backend_kind **out, fm_error *err) {
    *out = fm_backend_kind_find(name);
    if (*out) return FM_OK;
    return fm_fail(err, FM_ERR_USAGE, "%s: unknown backend '%s' (choose cpu or cuda)", what, name ? name : "(null)");
}

const fm_backend_kind *fm_backend_kind_of(const fm_backend *be) { return fm_backend_kind_find(be->ops->name); }

const char *fm_backend_lookup(const char *name) {
    const fm_backend_kind *kind = fm_backend_kind_find(name);
    return kind ? kind->name : NULL;
}
