/* images.h — `--image FILE` for the CLI verbs (generate, logits, chat): read and preprocess every image
 * named, and turn a prompt into one whose image placeholders are expanded to the images' token counts. */
#ifndef CI_CLI_IMAGES_H
#define CI_CLI_IMAGES_H

#include <stdint.h>

#include "cinfer.h"

/* Every "--image FILE" in argv, in order, loaded for m. 0 (and *n = 0 with none given), or 1 with a message
 * on stderr. */
int cli_images_load(cinfer_model *m, int argc, char **argv, const char *verb, cinfer_image ***out, int *n);
void cli_images_free(cinfer_image **ims, int n);

/* A prompt for images from text: TEXT used as is when it already holds <|image_pad|> placeholders; else, with
 * a chat template, one user message of the images then the text (generation prompt added); else the
 * placeholders prepended. Then tokenized and expanded. 0, or 1 with a message. */
int cli_images_prompt_text(cinfer_model *m, const char *text, cinfer_image **ims, int n, const char *verb,
                           int32_t **ids, int *n_ids);
/* Token ids holding one <|image_pad|> per image (after <|vision_start|>) expanded in place. */
int cli_images_expand(cinfer_model *m, int32_t **ids, int *n_ids, cinfer_image **ims, int n,
                      const char *verb);

#endif
