/* The GPT-2 byte-level alphabet (`tokenizers`' ByteLevel): printable bytes stand for themselves, the other 68
 * bytes (controls, space, 0x7F-0xA0, 0xAD) become U+0100.. in byte order, so every byte is one visible character. */
#include "text/tok_internal.h"

static bool printable(unsigned b) { return (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE; }

uint32_t tok_byte_to_cp(uint8_t b) {
    if (printable(b)) return b;
    uint32_t k = 0; /* how many non-printable bytes come before b */
    for (unsigned c = 0; c < b; c++) k += !printable(c);
    return 256 + k;
}

int tok_cp_to_byte(uint32_t cp) {
    if (cp < 256) return printable(cp) ? (int)cp : -1;
    if (cp >= 256 + 68) return -1;
    uint32_t k = cp - 256;
    for (unsigned c = 0; c < 256; c++)
        if (!printable(c) && k-- == 0) return (int)c;
    return -1;
}
