/* A stand-in NVIDIA driver (libcuda.so.1) that reports no device, for `make gpu-check`: with it,
 * ORT's CUDA provider loads completely and must fail with CUDA's "no CUDA-capable device" error
 * (code 100), which proves every library it needs resolved. Never installed anywhere. */
#define NO_DEVICE 100

int cuInit(unsigned int flags) { (void)flags; return NO_DEVICE; }
int cuDriverGetVersion(int *version) { if (version) *version = 13000; return 0; }
int cuDeviceGetCount(int *count) { if (count) *count = 0; return NO_DEVICE; }
int cuDeviceGet(int *device, int ordinal) { (void)device; (void)ordinal; return NO_DEVICE; }
int cuGetExportTable(const void **table, const void *id) { (void)table; (void)id; return NO_DEVICE; }
int cuGetErrorString(int error, const char **text) {
    /* Not CUDA's wording: the check must find that in CUDA's own (cudart's) message. */
    if (text) *text = error == NO_DEVICE ? "stub driver: no device" : "stub driver: error";
    return 0;
}
int cuGetErrorName(int error, const char **text) {
    if (text) *text = error == NO_DEVICE ? "CUDA_ERROR_NO_DEVICE" : "CUDA_ERROR_UNKNOWN";
    return 0;
}
int cuGetProcAddress(const char *symbol, void **fn, int version, unsigned long long flags) {
    (void)symbol; (void)version; (void)flags;
    if (fn) *fn = 0;
    return NO_DEVICE;
}
int cuGetProcAddress_v2(const char *symbol, void **fn, int version, unsigned long long flags, int *status) {
    (void)symbol; (void)version; (void)flags;
    if (fn) *fn = 0;
    if (status) *status = 1;
    return NO_DEVICE;
}

/* Entry points ORT's CUDA provider looks up when it loads (its CUDADriverWrapper aborts on a
 * missing one); never reached, since no device exists. */
#define UNREACHABLE(name) int name(void) { return NO_DEVICE; }
UNREACHABLE(cuDeviceGetAttribute)
UNREACHABLE(cuFuncSetAttribute)
UNREACHABLE(cuFuncSetCacheConfig)
UNREACHABLE(cuLaunchCooperativeKernel)
UNREACHABLE(cuLaunchKernel)
UNREACHABLE(cuLinkAddData_v2)
UNREACHABLE(cuLinkAddFile_v2)
UNREACHABLE(cuLinkComplete)
UNREACHABLE(cuLinkCreate_v2)
UNREACHABLE(cuLinkDestroy)
UNREACHABLE(cuModuleGetFunction)
UNREACHABLE(cuModuleLoadData)
UNREACHABLE(cuModuleUnload)
