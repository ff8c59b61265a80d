// The first lines of the address-space check (mtwork/backends/sim/compile/address_spaces.py):
// kernels are parsed as C++ for OpenCL, whose address spaces are real, with Metal's words
// mapped onto them in mtw_base.h. OpenCL's own keywords are ordinary names in Metal code
// (`local` is a common variable, `access::read_write` an enumerator), so they are renamed
// before anything is read; `half` is the shim's _Float16 under another name.
#pragma once

#define global __mtw_global
#define local __mtw_local
#define generic __mtw_generic
#define pipe __mtw_pipe
#define half __mtw_half
#define read_only __mtw_read_only
#define write_only __mtw_write_only
#define read_write __mtw_read_write
#define vec_step __mtw_vec_step
#define image1d_t __mtw_image1d_t
#define image2d_t __mtw_image2d_t
#define image3d_t __mtw_image3d_t
#define sampler_t __mtw_sampler_t
#define event_t __mtw_event_t
#define queue_t __mtw_queue_t
#define reserve_id_t __mtw_reserve_id_t
#define clk_event_t __mtw_clk_event_t
// OpenCL's atomic types are built in: Metal's (metal::atomic_uint, ...) would be ambiguous
// beside them after `using namespace metal`.
#define atomic_int __mtw_atomic_int
#define atomic_uint __mtw_atomic_uint
#define atomic_long __mtw_atomic_long
#define atomic_ulong __mtw_atomic_ulong
#define atomic_float __mtw_atomic_float
#define atomic_double __mtw_atomic_double
#define atomic_flag __mtw_atomic_flag

// Metal has function pointers (MSL 2.3 and later) and the shim has variadic helpers.
#pragma OPENCL EXTENSION __cl_clang_function_pointers : enable
#pragma OPENCL EXTENSION __cl_clang_variadic_functions : enable
#pragma OPENCL EXTENSION cl_khr_fp16 : enable

// The SIMD-group functions, declared only (the check parses, never runs): the shim's own
// are C++ the check's language does not read, and a call of an undeclared one would end
// the check's reading of the expression it is in, address-space errors and all.
namespace metal {
#define MTW_CHECK_ONE(name) template <typename T> T name(T);
#define MTW_CHECK_LANE(name) template <typename T> T name(T, unsigned short);
MTW_CHECK_ONE(simd_sum) MTW_CHECK_ONE(simd_product) MTW_CHECK_ONE(simd_min)
MTW_CHECK_ONE(simd_max) MTW_CHECK_ONE(simd_and) MTW_CHECK_ONE(simd_or) MTW_CHECK_ONE(simd_xor)
MTW_CHECK_ONE(quad_sum) MTW_CHECK_ONE(quad_product) MTW_CHECK_ONE(quad_min)
MTW_CHECK_ONE(quad_max) MTW_CHECK_ONE(quad_and) MTW_CHECK_ONE(quad_or) MTW_CHECK_ONE(quad_xor)
MTW_CHECK_ONE(simd_prefix_inclusive_sum) MTW_CHECK_ONE(simd_prefix_exclusive_sum)
MTW_CHECK_ONE(simd_prefix_inclusive_product) MTW_CHECK_ONE(simd_prefix_exclusive_product)
MTW_CHECK_ONE(simd_broadcast_first)
MTW_CHECK_LANE(simd_broadcast) MTW_CHECK_LANE(simd_shuffle) MTW_CHECK_LANE(simd_shuffle_up)
MTW_CHECK_LANE(simd_shuffle_down) MTW_CHECK_LANE(simd_shuffle_xor)
MTW_CHECK_LANE(quad_broadcast) MTW_CHECK_LANE(quad_shuffle) MTW_CHECK_LANE(quad_shuffle_up)
MTW_CHECK_LANE(quad_shuffle_down) MTW_CHECK_LANE(quad_shuffle_xor)
#undef MTW_CHECK_ONE
#undef MTW_CHECK_LANE
}  // namespace metal
