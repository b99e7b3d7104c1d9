// stb_image's implementation, compiled into the image fuzz target with the
// fuzzer's instrumentation (the main build links Debian's libstb instead).
#define STB_IMAGE_IMPLEMENTATION
#include <stb_image.h>
