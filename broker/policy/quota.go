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

// Plus is q and d added class by class, in a new quota.
func (q Quota) Plus(d Quota) Quota {
	out := make(Quota, len(q)+len(d))
	for k, n := range q {
		out[k] = n
	}
	for k, n := range d {
		out[k] += n
	}
	return out
}
