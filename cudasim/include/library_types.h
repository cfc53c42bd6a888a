/* library_types.h of the CUDA simulator: the data types cuBLAS speaks (CUDA's values). */
#ifndef KD_SIM_LIBRARY_TYPES_H
#define KD_SIM_LIBRARY_TYPES_H

typedef enum cudaDataType_t {
    CUDA_R_16F = 2,
    CUDA_R_32F = 0,
    CUDA_R_64F = 1,
    CUDA_R_16BF = 14
} cudaDataType_t;
typedef cudaDataType_t cudaDataType;

#endif
