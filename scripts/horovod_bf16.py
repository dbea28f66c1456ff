"""hvdtrain's patch set giving Horovod 0.28.1 a bfloat16 data type (torch.bfloat16 on the wire).

Standard library only, imported by install_horovod.py. 0.28.1 knows float16 but not bfloat16: a bf16 tensor in
any collective raises `Tensor type torch.BFloat16Tensor is not supported`. These text patches add
HOROVOD_BFLOAT16 beside HOROVOD_FLOAT16 everywhere the type is switched on: its name and size, the torch
adapter and the Python bindings (`..._torch_BFloat16Tensor`), the CPU scaling of averages, Gloo (a 2-byte element
type with + * <), MPI (float16's 2-byte datatype, bfloat16's own reduction ops), NCCL (ncclBfloat16, NCCL >= 2.10)
and the CUDA scaling kernels. Adasum and ROCm keep refusing it with Horovod's own "Unsupported data type" error.
Sums are computed in float32 and rounded to nearest even, as torch rounds.
"""
from __future__ import annotations

import hashlib

BF16_MARKER = "hvdtrain: bfloat16"
# The binding hvdtrain's seam (and install_horovod's "already installed" check) looks for.
BF16_BINDING = "horovod_torch_allreduce_async_torch_BFloat16Tensor"

_MESSAGE_H = (("  HOROVOD_BOOL = 9,\n};", f"  HOROVOD_BOOL = 9,\n  HOROVOD_BFLOAT16 = 10,  // {BF16_MARKER}\n}};"),)

_MESSAGE_CC = (
    ('    case HOROVOD_BOOL:\n      static const std::string bool_("bool");\n      return bool_;\n',
     '    case HOROVOD_BOOL:\n      static const std::string bool_("bool");\n      return bool_;\n'
     f'    case HOROVOD_BFLOAT16:  // {BF16_MARKER}\n'
     '      static const std::string bfloat16("bfloat16");\n      return bfloat16;\n'),
    ("    case HOROVOD_BOOL:\n      return sizeof(bool);\n",
     "    case HOROVOD_BOOL:\n      return sizeof(bool);\n    case HOROVOD_BFLOAT16:\n      return 2;\n"),
)

_HALF_HELPERS = f"""// {BF16_MARKER}. bfloat16 is the upper half of an IEEE float32: widening is a shift; narrowing
// rounds to nearest even, as torch does, and keeps a NaN a NaN (plain rounding could carry it to infinity).
inline float BFloat16BitsToFloat(uint16_t bits) {{
  uint32_t word = static_cast<uint32_t>(bits) << 16;
  float value;
  std::memcpy(&value, &word, sizeof(value));
  return value;
}}

inline uint16_t FloatToBFloat16Bits(float value) {{
  uint32_t word;
  std::memcpy(&word, &value, sizeof(word));
  if ((word & 0x7fffffffu) > 0x7f800000u) {{
    return static_cast<uint16_t>((word >> 16) | 0x0040u);
  }}
  word += 0x7fffu + ((word >> 16) & 1u);
  return static_cast<uint16_t>(word >> 16);
}}

// Gloo's reductions are templates over the element type: they need + * and < on it.
struct alignas(2) BFloat16 {{
  uint16_t bits;
}};

inline BFloat16 operator+(BFloat16 a, BFloat16 b) {{
  return BFloat16{{FloatToBFloat16Bits(BFloat16BitsToFloat(a.bits) + BFloat16BitsToFloat(b.bits))}};
}}

inline BFloat16 operator*(BFloat16 a, BFloat16 b) {{
  return BFloat16{{FloatToBFloat16Bits(BFloat16BitsToFloat(a.bits) * BFloat16BitsToFloat(b.bits))}};
}}

inline bool operator<(BFloat16 a, BFloat16 b) {{
  return BFloat16BitsToFloat(a.bits) < BFloat16BitsToFloat(b.bits);
}}

inline void ScaleBFloat16Buffer(const uint16_t* input, uint16_t* output, int64_t num_elements,
                                float scale_factor) {{
  for (int64_t i = 0; i < num_elements; ++i) {{
    output[i] = FloatToBFloat16Bits(scale_factor * BFloat16BitsToFloat(input[i]));
  }}
}}

#if HAVE_MPI
// MPI_User_function: reduce invec into inoutvec, element by element, in float32.
#define HVDTRAIN_BF16_MPI_OP(name, expr)                                        \\
  inline void name(void* invec, void* inoutvec, int* len, MPI_Datatype*) {{     \\
    const auto* in = static_cast<const uint16_t*>(invec);                       \\
    auto* inout = static_cast<uint16_t*>(inoutvec);                             \\
    for (int i = 0; i < *len; ++i) {{                                            \\
      float a = BFloat16BitsToFloat(inout[i]);                                  \\
      float b = BFloat16BitsToFloat(in[i]);                                     \\
      inout[i] = FloatToBFloat16Bits(expr);                                     \\
    }}                                                                           \\
  }}
HVDTRAIN_BF16_MPI_OP(bfloat16_sum, a + b)
HVDTRAIN_BF16_MPI_OP(bfloat16_min, b < a ? b : a)
HVDTRAIN_BF16_MPI_OP(bfloat16_max, a < b ? b : a)
HVDTRAIN_BF16_MPI_OP(bfloat16_prod, a * b)
#undef HVDTRAIN_BF16_MPI_OP
#endif

"""
_HALF_H = (
    ("#include <stdint.h>\n", "#include <stdint.h>\n#include <cstring>\n"),
    ("#if HAVE_MPI\nvoid float16_sum(", _HALF_HELPERS + "#if HAVE_MPI\nvoid float16_sum("),
)

_COLLECTIVE_CC = ((
    "  case HOROVOD_FLOAT64:\n    ScaleBufferCPUImpl((const double*)fused_input_data, (double*)buffer_data,\n"
    "                       num_elements, scale_factor);\n    break;\n",
    "  case HOROVOD_FLOAT64:\n    ScaleBufferCPUImpl((const double*)fused_input_data, (double*)buffer_data,\n"
    "                       num_elements, scale_factor);\n    break;\n"
    f"  case HOROVOD_BFLOAT16:  // {BF16_MARKER}\n"
    "    ScaleBFloat16Buffer((const uint16_t*)fused_input_data, (uint16_t*)buffer_data,\n"
    "                        num_elements, (float)scale_factor);\n    break;\n"),)

_GLOO_CC = ((
    "  case HOROVOD_BOOL:\n    return new GlooAlgorithms<bool>(gloo_context);\n",
    "  case HOROVOD_BOOL:\n    return new GlooAlgorithms<bool>(gloo_context);\n"
    f"  case HOROVOD_BFLOAT16:  // {BF16_MARKER}\n    return new GlooAlgorithms<BFloat16>(gloo_context);\n"),)

_MPI_CONTEXT_H = ((
    "  MPI_Op mpi_float16_prod;\n",
    "  MPI_Op mpi_float16_prod;\n\n"
    f"  // {BF16_MARKER}: its elements travel as mpi_float16_t (2 contiguous bytes), reduced by its own ops.\n"
    "  MPI_Op mpi_bfloat16_sum = MPI_OP_NULL;\n  MPI_Op mpi_bfloat16_min = MPI_OP_NULL;\n"
    "  MPI_Op mpi_bfloat16_max = MPI_OP_NULL;\n  MPI_Op mpi_bfloat16_prod = MPI_OP_NULL;\n"),)

_CREATE_CALL = ("  CreateMPIFloat16TypeAndOps(mpi_float16_t, mpi_float16_sum, mpi_float16_min,\n"
                "                             mpi_float16_max, mpi_float16_prod);\n")
_CREATE_BF16_CALL = ("  CreateMPIBFloat16Ops(mpi_bfloat16_sum, mpi_bfloat16_min, mpi_bfloat16_max,\n"
                     "                       mpi_bfloat16_prod);\n")


def _op_patch(kind: str, mpi_op: str) -> tuple[str, str]:
    old = f"  return dtype == HOROVOD_FLOAT16 ? mpi_float16_{kind} : {mpi_op};\n"
    return old, f"  if (dtype == HOROVOD_BFLOAT16) {{\n    return mpi_bfloat16_{kind};\n  }}\n{old}"


_MPI_CONTEXT_CC = (
    ("  case HOROVOD_BOOL:\n    return MPI_C_BOOL;\n",
     "  case HOROVOD_BOOL:\n    return MPI_C_BOOL;\n"
     f"  case HOROVOD_BFLOAT16:  // {BF16_MARKER}\n    return mpi_float16_t;\n"),
    _op_patch("sum", "MPI_SUM"), _op_patch("min", "MPI_MIN"), _op_patch("max", "MPI_MAX"),
    _op_patch("prod", "MPI_PROD"),
    ("void CreateMPILocalAndCrossComm(MPI_Comm mpi_comm,",
     "void CreateMPIBFloat16Ops(MPI_Op& sum, MPI_Op& min, MPI_Op& max, MPI_Op& prod) {\n"
     "  MPI_Op_create(&bfloat16_sum, 1, &sum);\n  MPI_Op_create(&bfloat16_min, 1, &min);\n"
     "  MPI_Op_create(&bfloat16_max, 1, &max);\n  MPI_Op_create(&bfloat16_prod, 1, &prod);\n}\n\n"
     "void CreateMPILocalAndCrossComm(MPI_Comm mpi_comm,"),
    (_CREATE_CALL + "}\n\nvoid MPIContext::InitializeForProcessSet",
     _CREATE_CALL + _CREATE_BF16_CALL + "}\n\nvoid MPIContext::InitializeForProcessSet"),
    (_CREATE_CALL + "}\n\nvoid MPIContext::Finalize(",
     _CREATE_CALL + _CREATE_BF16_CALL + "}\n\nvoid MPIContext::Finalize("),
    ("    MPI_Op_free(&mpi_float16_prod);\n  }\n",
     "    MPI_Op_free(&mpi_float16_prod);\n  }\n"
     + "".join(f"  if (mpi_bfloat16_{kind} != MPI_OP_NULL) {{\n    MPI_Op_free(&mpi_bfloat16_{kind});\n  }}\n"
               for kind in ("sum", "min", "max", "prod"))),
)

# ncclBfloat16 is 9 from NCCL 2.10 on, but nccl.h declares the name only when cuda_bf16.h came first.
_NCCL_CC = ((
    "  case HOROVOD_FLOAT64:\n    return ncclFloat64;\n",
    "  case HOROVOD_FLOAT64:\n    return ncclFloat64;\n"
    f"#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 10, 0)  // {BF16_MARKER}\n"
    "  case HOROVOD_BFLOAT16:\n    return static_cast<ncclDataType_t>(9);\n#endif\n"),)

_CUDA_KERNELS = f"""// {BF16_MARKER}: conversions only (no bf16 arithmetic), so every architecture compiles it.
__global__ void scale_buffer_bf16_k(const __nv_bfloat16* input, __nv_bfloat16* output, int64_t num_elements,
                                    float scale_factor) {{
  for (int64_t i = blockIdx.x * (int64_t) blockDim.x + threadIdx.x; i < num_elements;
       i += (int64_t) blockDim.x * gridDim.x) {{
    output[i] = __float2bfloat16(scale_factor * __bfloat162float(input[i]));
  }}
}}

template<int blocks_per_copy>
__global__ void batched_scaled_memcpy_bf16_k(BatchedD2DParams params, float scale_factor) {{
  const size_t idx = blockDim.x * (blockIdx.x % blocks_per_copy) + threadIdx.x;
  const size_t count = params.sizes[blockIdx.x / blocks_per_copy] / sizeof(__nv_bfloat16);
  const __nv_bfloat16* input = reinterpret_cast<const __nv_bfloat16*>(params.in[blockIdx.x / blocks_per_copy]);
  __nv_bfloat16* output = reinterpret_cast<__nv_bfloat16*>(params.out[blockIdx.x / blocks_per_copy]);
  for (size_t i = idx; i < count; i += blockDim.x * blocks_per_copy) {{
    output[i] = __float2bfloat16(scale_factor * __bfloat162float(input[i]));
  }}
}}

#define NTHREADS_SCALE_BUFFER_KERNEL 512
"""
_CUDA_CU = (
    ("#include <cuda_fp16.h>\n", "#include <cuda_fp16.h>\n#include <cuda_bf16.h>\n"),
    ("#define NTHREADS_SCALE_BUFFER_KERNEL 512\n", _CUDA_KERNELS),
    ("    default:\n      throw std::logic_error(\"Type \" + DataType_Name(dtype) +\n"
     "                             \" not supported by ScaleBufferCudaImpl.\");\n",
     "    case HOROVOD_BFLOAT16:\n"
     "      scale_buffer_bf16_k<<<blocks, threads, 0, stream>>>((const __nv_bfloat16*) fused_input_data,\n"
     "                                                          (__nv_bfloat16*) buffer_data, num_elements,\n"
     "                                                          (float) scale_factor);\n      break;\n"
     "    default:\n      throw std::logic_error(\"Type \" + DataType_Name(dtype) +\n"
     "                             \" not supported by ScaleBufferCudaImpl.\");\n"),
    ("   default:\n     throw std::logic_error(\"Type \" + DataType_Name(dtype) +\n"
     "                            \" not supported by BatchedScaledD2DMemcpyCudaImpl.\");\n",
     "   case HOROVOD_BFLOAT16:\n"
     "     batched_scaled_memcpy_bf16_k<BLOCKS_PER_COPY_D2D_KERNEL><<<blocks, threads, 0, stream>>>(params,\n"
     "                                                                                  (float) scale_factor);\n"
     "     break;\n"
     "   default:\n     throw std::logic_error(\"Type \" + DataType_Name(dtype) +\n"
     "                            \" not supported by BatchedScaledD2DMemcpyCudaImpl.\");\n"),
)

_ADAPTER_CC = (
    ("  case common::HOROVOD_FLOAT64:\n    return ::torch::kDouble;\n",
     "  case common::HOROVOD_FLOAT64:\n    return ::torch::kDouble;\n"
     f"  case common::HOROVOD_BFLOAT16:  // {BF16_MARKER}\n    return ::torch::kBFloat16;\n"),
    ("  case ::torch::kDouble:\n    return common::HOROVOD_FLOAT64;\n",
     "  case ::torch::kDouble:\n    return common::HOROVOD_FLOAT64;\n"
     "  case ::torch::kBFloat16:\n    return common::HOROVOD_BFLOAT16;\n"),
)

# (operation, CPU entry point, GPU-build macro, host-staged entry point for builds without that GPU op)
_OPS = (("allreduce", "DoAllreduce", "HOROVOD_GPU_ALLREDUCE"),
        ("grouped_allreduce", "DoGroupedAllreduce", "HOROVOD_GPU_ALLREDUCE"),
        ("allgather", "DoAllgather", "HOROVOD_GPU_ALLGATHER"),
        ("grouped_allgather", "DoGroupedAllgather", "HOROVOD_GPU_ALLGATHER"),
        ("broadcast", "DoBroadcast", "HOROVOD_GPU_BROADCAST"),
        ("alltoall", "DoAlltoall", "HOROVOD_GPU_ALLTOALL"),
        ("reducescatter", "DoReducescatter", "HOROVOD_GPU_REDUCESCATTER"),
        ("grouped_reducescatter", "DoGroupedReducescatter", "HOROVOD_GPU_REDUCESCATTER"))


def _bindings() -> str:
    lines = [f"  // {BF16_MARKER}: mpi_ops.py looks these names up from tensor.type()"]
    for op, entry, macro in _OPS:
        name = f"horovod_torch_{op}_async_torch"
        lines += [f'  m.def("{name}_BFloat16Tensor", &{entry});', f"#if {macro}",
                  f'  m.def("{name}_cuda_BFloat16Tensor", &{entry});', "#else",
                  f'  m.def("{name}_cuda_BFloat16Tensor", &{entry}CudaOnCPU);', "#endif"]
    return "\n".join(lines) + "\n\n"


_MPI_OPS_V2 = (("PYBIND11_MODULE(mpi_lib_v2, m) {\n", "PYBIND11_MODULE(mpi_lib_v2, m) {\n" + _bindings()),)

BF16_PATCHES = {
    "horovod/common/message.h": _MESSAGE_H,
    "horovod/common/message.cc": _MESSAGE_CC,
    "horovod/common/half.h": _HALF_H,
    "horovod/common/ops/collective_operations.cc": _COLLECTIVE_CC,
    "horovod/common/ops/gloo_operations.cc": _GLOO_CC,
    "horovod/common/mpi/mpi_context.h": _MPI_CONTEXT_H,
    "horovod/common/mpi/mpi_context.cc": _MPI_CONTEXT_CC,
    "horovod/common/ops/nccl_operations.cc": _NCCL_CC,
    "horovod/common/ops/cuda/cuda_kernels.cu": _CUDA_CU,
    "horovod/torch/adapter_v2.cc": _ADAPTER_CC,
    "horovod/torch/mpi_ops_v2.cc": _MPI_OPS_V2,
}


def patch_set_hash(*patch_sets: dict[str, tuple[tuple[str, str], ...]]) -> str:
    """A short digest of patch texts: part of the wheel cache key, so a changed patch set never reuses a wheel."""
    digest = hashlib.sha256()
    for patches in patch_sets:
        for rel in sorted(patches):
            digest.update(rel.encode())
            for old, new in patches[rel]:
                digest.update(b"\0" + old.encode() + b"\0" + new.encode())
    return digest.hexdigest()[:10]
