/* The output directory of fm_requantize (requantize.h): checked and prepared before anything is written, the
 * checkpoint's other files copied, JSON files written, config.json with its quantization_config written last. */
#ifndef FM_ENGINE_REQUANTIZE_DIR_H
#define FM_ENGINE_REQUANTIZE_DIR_H

#include <cjson/cJSON.h>

#include "engine/requantize.h"
#include "model/model_src.h"

/* out_dir: created when missing; refused when it is in_dir, or not empty without force (with force its safetensors
 * files and shard index are removed first, so no stale shard outlives the new checkpoint). */
fm_status fm_requant_prepare_dir(const fm_requant_opts *o, fm_error *err);
/* Copies every regular file of in_dir except config.json, *.safetensors and the shard index (tokenizer files, the
 * generation config, ...). */
fm_status fm_requant_copy_files(const fm_requant_opts *o, fm_error *err);
/* Writes root, indented, as dir/name (through name.partial and a rename). */
fm_status fm_requant_write_json(const char *dir, const char *name, const cJSON *root, fm_error *err);
/* in_dir/config.json with quantization_config added (ignore: each router and lm_head), as out_dir/config.json. */
fm_status fm_requant_write_config(const fm_requant_opts *o, const fm_model_src *src, fm_error *err);

#endif
