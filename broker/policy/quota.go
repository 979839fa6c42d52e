package policy

// Total is the quota's count of all GPUs: the AllGPUs key, or the sum of classes.
func (q Quota) Total() float64 {
	if n, ok := q[AllGPUs]; ok {
		return n
	}
	total := 0.0
	for _, n := range q {
		total += n
	}
	return total
}
