/* epbuild's OpenVINO vendor-id shim: lets the onnxruntime-ep-openvino plugin offer its CPU device on non-Intel
 * x86-64 CPUs, which OpenVINO's CPU plugin supports but the EP's device filter refuses (it wants vendor id
 * 0x8086, see microsoft/onnxruntime#31981).
 *
 * ONNX Runtime loads this library in place of the plugin (register_execution_provider_library). It loads the real
 * plugin from $EPBUILD_OPENVINO_PLUGIN (so the plugin still finds its OpenVINO libraries next to itself) and calls
 * its CreateEpFactories with an OrtApiBase whose GetApi returns a copy of the OrtApi table in which
 * HardwareDevice_VendorId answers 0x8086 for CPU-type devices; every other entry, and GPU/NPU devices, are
 * unchanged. OrtApi is append-only, so the slot numbers hold across ONNX Runtime versions.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SLOT_HARDWARE_DEVICE_TYPE 307   /* OrtApi::HardwareDevice_Type */
#define SLOT_HARDWARE_DEVICE_VENDOR_ID 308   /* OrtApi::HardwareDevice_VendorId */
#define MAX_SLOTS 1024                  /* more than any OrtApi has; the copy stops at the table's mapping end */
#define DEVICE_TYPE_CPU 0               /* OrtHardwareDeviceType_CPU */
#define INTEL 0x8086

typedef void OrtStatus;
typedef void *Slot;
typedef struct {
    const void *(*GetApi)(uint32_t version);
    const char *(*GetVersionString)(void);
} OrtApiBase;
typedef OrtStatus *(*CreateFn)(const char *, const OrtApiBase *, const void *, void **, size_t, size_t *);
typedef OrtStatus *(*ReleaseFn)(void *);
typedef int (*DeviceTypeFn)(const void *);
typedef uint32_t (*VendorIdFn)(const void *);
typedef OrtStatus *(*CreateStatusFn)(int code, const char *message);  /* OrtApi slot 0 */

static const OrtApiBase *real_base;
static OrtApiBase shim_base;
static Slot api_copy[MAX_SLOTS];
static const void *copied_from;
static DeviceTypeFn device_type;
static VendorIdFn vendor_id;
static ReleaseFn real_release;

static uint32_t shim_vendor_id(const void *device) {
    return device_type(device) == DEVICE_TYPE_CPU ? INTEL : vendor_id(device);
}

/* How many pointer slots can be read from `table` without leaving its memory mapping. */
static size_t readable_slots(const void *table) {
    FILE *maps = fopen("/proc/self/maps", "r");
    uintptr_t address = (uintptr_t)table, start, end;
    char line[512];
    size_t slots = 0;
    if (!maps) return 0;
    while (fgets(line, sizeof line, maps)) {
        if (sscanf(line, "%lx-%lx", &start, &end) == 2 && start <= address && address < end) {
            slots = (end - address) / sizeof(Slot);
            break;
        }
    }
    fclose(maps);
    return slots < MAX_SLOTS ? slots : MAX_SLOTS;
}

static const void *shim_get_api(uint32_t version) {
    const void *api = real_base->GetApi(version);
    size_t slots;
    if (!api) return NULL;
    if (api != copied_from) {
        slots = readable_slots(api);
        if (slots <= SLOT_HARDWARE_DEVICE_VENDOR_ID) return api;  /* an OrtApi without the slot: nothing to do */
        memcpy(api_copy, api, slots * sizeof(Slot));
        device_type = (DeviceTypeFn)api_copy[SLOT_HARDWARE_DEVICE_TYPE];
        vendor_id = (VendorIdFn)api_copy[SLOT_HARDWARE_DEVICE_VENDOR_ID];
        api_copy[SLOT_HARDWARE_DEVICE_VENDOR_ID] = (Slot)shim_vendor_id;
        copied_from = api;
    }
    return api_copy;
}

/* An ORT_FAIL status with `message`, so ONNX Runtime reports why registration failed. */
static OrtStatus *failure(const OrtApiBase *base, const char *message) {
    const Slot *api = base->GetApi(1);
    return ((CreateStatusFn)api[0])(1, message);
}

__attribute__((visibility("default")))
OrtStatus *CreateEpFactories(const char *registration_name, const OrtApiBase *ort_api_base,
                             const void *default_logger, void **factories, size_t max_factories,
                             size_t *num_factories) {
    const char *path = getenv("EPBUILD_OPENVINO_PLUGIN");
    char message[1024];
    void *plugin;
    CreateFn create;
    if (!path) return failure(ort_api_base, "epbuild OpenVINO shim: EPBUILD_OPENVINO_PLUGIN is not set");
    if (!(plugin = dlopen(path, RTLD_NOW | RTLD_LOCAL))) {
        snprintf(message, sizeof message, "epbuild OpenVINO shim: cannot load %s: %s", path, dlerror());
        return failure(ort_api_base, message);
    }
    create = (CreateFn)dlsym(plugin, "CreateEpFactories");
    real_release = (ReleaseFn)dlsym(plugin, "ReleaseEpFactory");
    if (!create || !real_release) {
        snprintf(message, sizeof message, "epbuild OpenVINO shim: %s exports no CreateEpFactories", path);
        return failure(ort_api_base, message);
    }
    real_base = ort_api_base;
    shim_base.GetApi = shim_get_api;
    shim_base.GetVersionString = ort_api_base->GetVersionString;
    return create(registration_name, &shim_base, default_logger, factories, max_factories, num_factories);
}

__attribute__((visibility("default")))
OrtStatus *ReleaseEpFactory(void *factory) {
    return real_release ? real_release(factory) : NULL;
}
